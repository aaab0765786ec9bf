"""backends layer: see ../shared/DESIGN.md."""
