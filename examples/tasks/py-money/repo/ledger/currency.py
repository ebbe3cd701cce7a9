"""Display of amounts with a currency symbol."""

SYMBOLS = {"EUR": "€", "USD": "$", "GBP": "£"}


def format_amount(amount, currency):
    symbol = SYMBOLS.get(currency, currency + " ")
    return f"{symbol}{amount:,.2f}"
