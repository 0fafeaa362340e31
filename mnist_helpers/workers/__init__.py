"""DDP worker scripts, launched with torchrun (or plain Python for a world of one)."""
