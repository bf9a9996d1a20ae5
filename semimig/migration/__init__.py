"""semimig.migration."""
