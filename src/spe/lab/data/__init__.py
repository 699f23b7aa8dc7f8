"""Data: symbolic music as REMI tokens (needs the ``music`` extra)."""
