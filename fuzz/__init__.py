"""Coverage-guided fuzz targets, one per codec (fuzz/README.md)."""
