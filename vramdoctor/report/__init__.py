"""Faces of a result: terminal (rich), JSON, charts. Never measures anything."""
