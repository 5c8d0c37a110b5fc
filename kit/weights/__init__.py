"""Model weights you can trust: pinned revisions, the lock file, pulling and verifying them."""
