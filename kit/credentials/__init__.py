"""Credential material, the credential files on disk, and the TLS certificates."""
