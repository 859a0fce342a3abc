"""The wire: authenticated frames, typed control messages and the columnar batch codec."""
