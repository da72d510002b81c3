"""The settings: one pydantic model per section, validated once (pure data, the bottom)."""
