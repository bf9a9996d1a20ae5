"""semimig.resizing."""
