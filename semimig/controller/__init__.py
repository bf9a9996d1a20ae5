"""semimig.controller."""
