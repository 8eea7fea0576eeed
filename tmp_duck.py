import time, duckdb
run = "/tmp/ranks_bench_try/run"
q1 = f"""
SELECT rank, iteration AS peak_iteration, peak_allocated_bytes, peak_module, peak_phase
FROM read_parquet('{run}/rank=*/iterations.parquet/*.parquet', hive_partitioning = true)
ORDER BY peak_allocated_bytes DESC, rank, iteration
LIMIT 1
"""
q2 = f"""
SELECT rank,
       max(peak_allocated_bytes) AS peak_allocated_bytes,
       arg_min(iteration, (-peak_allocated_bytes, iteration)) AS peak_iteration,
       arg_min(peak_module, (-peak_allocated_bytes, iteration)) AS peak_module,
       arg_min(peak_phase, (-peak_allocated_bytes, iteration)) AS peak_phase,
       count(DISTINCT iteration) AS iterations,
       max(peak_reserved_bytes) AS peak_reserved_bytes
FROM read_parquet('{run}/rank=*/iterations.parquet/*.parquet', hive_partitioning = true)
GROUP BY rank ORDER BY rank
"""
q3 = f"""
SELECT rank, iteration // 1000 * 1000 AS first_iteration, max(peak_allocated_bytes) AS peak_allocated_bytes
FROM read_parquet('{run}/rank=*/iterations.parquet/*.parquet', hive_partitioning = true)
GROUP BY ALL ORDER BY rank, first_iteration
"""
q4 = f"""
SELECT module, max(saved_bytes) AS saved_bytes, arg_max(rank, saved_bytes) AS rank, count(DISTINCT rank) AS ranks
FROM read_parquet('{run}/rank=*/layers.parquet/*.parquet', hive_partitioning = true)
WHERE iteration = 50000 AND module <> ''
GROUP BY module ORDER BY saved_bytes DESC, module LIMIT 5
"""
for q in (q1,q2,q3,q4):
    for i in range(2):
        t=time.perf_counter(); r=duckdb.sql(q).fetchall(); dt=time.perf_counter()-t
    print(round(dt,3), len(r), r[:3])
