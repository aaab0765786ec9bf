"""runner layer: see ../shared/DESIGN.md."""
