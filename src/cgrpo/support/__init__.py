"""What the project's `GRPOTrainer` subclasses share, below the trainers and their configs: the trainer base class
(`base`), the checks of `GRPOConfig` options their configs share (`config_checks`), the model card (`model_card`),
their state in a checkpoint (`resume`), guards around a user's extractor and verifier (`user_code`), model loading
(`models`: hub ids, folders, GGUF checkpoints, LoRA adapters) and the colocated vLLM weight sync (`vllm_colocate`).

Nothing here imports a trainer or a config class of the package.
"""
