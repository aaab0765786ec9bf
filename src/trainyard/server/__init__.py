"""server layer: see ../shared/DESIGN.md."""
