"""Pipeline parallelism over MLX's own distributed layer (`mx.distributed`, launched with
`mlx.launch` or MLX_RANK + MLX_HOSTFILE; backends ring, jaccl, nccl): a checkpoint too big for
one machine, its trunk layers split across ranks, MTP decoding exactly as on one machine.

As mlx-lm's pipeline does, rank 0 holds the *last* layers: the final norm, the output projection
and the MTP head sit where the sampler and the server are, so drafting costs no message at all.
Rank N-1 holds the first layers and the embedding; activations travel N-1 -> N-2 -> ... -> 0,
each hop a neighbour on the ring (rank 0 reaches rank N-1 around it).

- split.py: which layers each rank holds (contiguous ranges, balanced by bytes);
- wire.py: the few messages (a fixed-size header, then the tokens or the hidden state), and a
  wait that does not spin (the ring backend's receive polls);
- stage.py: one rank's layers, caches, captured verify states and snapshots;
- adapter.py: rank 0's `PipelineAdapter`, one core.model.Adapter to core: a forward sends the
  tokens into the pipeline and finishes the last layers; rollback, frees and snapshots ride on
  the next header, so committing a verify costs no message of its own;
- worker.py: the loop every other rank runs, following rank 0's headers;
- watchdog.py: a rank that stops answering (MLX cannot cancel a receive: its sockets are cut);
- launch.py: start a rank (check that every rank has the same checkpoint and code, then load only
  this rank's layers, split by bytes and memory).

Imports: adapters.qwen3_5 and core.model only (a family's layers are run here, core never
imports this package).
"""
