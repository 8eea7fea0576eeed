"""From a trace to a chain: finding the chain in the module tree (or the graph), the stages' costs, the
whole step around it, recomputation options from the ``ops`` table, and accumulation's micro-batches."""
