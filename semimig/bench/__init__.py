"""semimig.bench."""
