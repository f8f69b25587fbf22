"""The ncu format."""
