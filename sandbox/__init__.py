"""sandbox package."""
