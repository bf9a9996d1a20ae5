"""semimig.allocation."""
