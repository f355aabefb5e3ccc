"""`cosyserve bench`: speed and memory of the engine on this machine, with the real model or random weights.

`full_random` builds the real architecture with random weights in memory, `runner` times one
utterance through the engine (`timing` keeps the clocks, `machine` describes the host), `report`
renders the result, `cli` adds the subcommand.
"""
