"""What a config's run will cost before it runs: every GPU job's rollouts, tokens and hours (`cost_plan`), the model's
size from its config (`model_size`) and each job's GPU memory against the card's (`memory_plan`)."""
