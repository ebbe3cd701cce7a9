package com.acme.roman;

/** Conversion between integers and Roman numerals in the standard range 1..3999. */
public final class RomanNumerals {
    private static final int[] VALUES = {1000, 500, 100, 90, 50, 40, 10, 9, 5, 4, 1};
    private static final String[] SYMBOLS = {"M", "D", "C", "XC", "L", "XL", "X", "IX", "V", "IV", "I"};

    private RomanNumerals() {}

    /** Returns the Roman numeral for {@code n}, using subtractive notation (4 is "IV"). */
    public static String toRoman(int n) {
        if (n < 1 || n > 3999) {
            throw new IllegalArgumentException("out of range: " + n);
        }
        StringBuilder out = new StringBuilder();
        for (int i = 0; i < VALUES.length; i++) {
            while (n >= VALUES[i]) {
                out.append(SYMBOLS[i]);
                n -= VALUES[i];
            }
        }
        return out.toString();
    }

    /** Parses a Roman numeral; a smaller symbol before a larger one is subtracted. */
    public static int fromRoman(String s) {
        if (s == null || s.isEmpty()) {
            throw new IllegalArgumentException("empty numeral");
        }
        int total = 0;
        for (int i = 0; i < s.length(); i++) {
            int value = Symbols.valueOf(s.charAt(i));
            int next = i + 1 < s.length() ? Symbols.valueOf(s.charAt(i + 1)) : 0;
            total += value < next ? -value : value;
        }
        return total;
    }
}
