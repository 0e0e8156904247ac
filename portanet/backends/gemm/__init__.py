"""The GEMM: tilings as pure functions of shapes (tiling), the paths a product can take
(paths), the router that measures each shape once and keeps its choice (router, routes),
and the tuning database (tuned)."""
