"""Tests mirroring the packages (issue 35 item 5)."""
