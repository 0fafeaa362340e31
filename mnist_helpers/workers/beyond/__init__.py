"""workers/beyond: 11_beyond_data_parallel's workers (sharding, distributed checkpoints, tensor parallel, compile,
pipelining), each runnable under torchrun and with plain Python; common.py holds the model they share."""
