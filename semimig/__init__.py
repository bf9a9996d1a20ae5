"""semimig."""
