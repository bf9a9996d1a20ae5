"""semimig.comm."""
