"""data layer: see ../shared/DESIGN.md."""
