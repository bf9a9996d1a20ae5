"""semimig.straggler."""
