"""The build of one variant: datasets, numeric checks, stages, DVC stage rendering."""
