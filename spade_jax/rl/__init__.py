"""Policy-gradient training: token log-probs, the PPO-clip loss, advantages and the train step."""
