"""What a run is, torch-free: the configuration by part, its fields' metadata, optimizer specs, the torch device option."""
