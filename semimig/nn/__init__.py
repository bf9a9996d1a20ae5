"""semimig.nn."""
