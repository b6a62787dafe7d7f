"""Torch-facing dataset, loader, workers, resumable state and streaming."""
