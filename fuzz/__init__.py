"""Coverage-guided fuzz targets, one per codec (issue 13, item 7; fuzz/README.md)."""
