"""Test plumbing shared by every capability: real processes, real servers, real files."""
