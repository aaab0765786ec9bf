"""engine layer: see ../shared/DESIGN.md."""
