"""The kineto format."""
