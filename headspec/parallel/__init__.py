"""Devices: mesh (the data/FSDP/tensor mesh of every command and the logical axis rules that shard parameters
and activations), distributed (jax.distributed set-up and the pmap path), compilations (the persistent
compilation cache, program counts). Stands on io/.
"""
