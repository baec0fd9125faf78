"""Stream reassembly: ordered chunks of interleaved streams to complete (or incomplete) calls."""
