"""What a run trains on: data sets, their partition over devices, per-device data folders, the model resolver."""
