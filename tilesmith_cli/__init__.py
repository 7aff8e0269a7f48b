"""The `tilesmith` command line: a client of the tilesmith library."""
