"""Reading runs back: comparing loss curves (and, later, run reports)."""
