"""spec layer: see ../shared/DESIGN.md."""
