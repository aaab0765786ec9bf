"""cli layer: see ../shared/DESIGN.md."""
