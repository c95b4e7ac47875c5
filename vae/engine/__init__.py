"""How a call runs, whatever the family: the engines read an architecture's declared capabilities
(vae/spec.py), never its name.

- route.py: a call as asked, the engine it takes and the one dispatch to it;
- replan.py: a call that runs out of memory, run again in less (half the budget, or half the tile);
- tiling.py: THE tile planner and blender (one threshold, from the tile's min size) and fast tiles;
- streaming.py: clips chunk by chunk through the model's causal caches;
- exact.py: exact tiles (the untiled result), over receptive.py (where tiles must meet: the model's
  segments and re-cut points), stages.py (tiles run stage by stage), park.py (paused tiles' storages on
  the offload device) and tiles.py (the tile grid and the output it writes);
- budget.py: the planner that picks tile and chunk for a memory budget, from memory.py's meta-device
  measurement of one call;
- transfer.py: every engine's copies between the compute device and host memory (from a GPU: pinned
  staging buffers, copies on the call's own stream overlapping the next tile, landed by events);
- distributed.py: one call over several ranks (torch.distributed);
- defined.py: families whose reference tiles as part of its definition (the model's own units);
- guard.py: the NaN guard and its redo in fp32.

Imports run down only: the engine imports nn/, files/ and the bottom modules (errors, spec, run,
checks), never the public face (handle, loading) or archs/."""
