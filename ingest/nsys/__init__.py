"""The nsys format."""
