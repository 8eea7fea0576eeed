"""memprof's native allocator reporter: the C++ source, its build, and the stream that reads it."""
