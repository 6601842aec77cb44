"""What a model is judged by: its metric, the budget on it, and the figures it gives."""
