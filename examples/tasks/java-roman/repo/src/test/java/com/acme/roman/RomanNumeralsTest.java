package com.acme.roman;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;

import org.junit.jupiter.api.Test;

class RomanNumeralsTest {
    @Test
    void formatsSmallNumbers() {
        assertEquals("III", RomanNumerals.toRoman(3));
        assertEquals("IV", RomanNumerals.toRoman(4));
        assertEquals("XLII", RomanNumerals.toRoman(42));
    }

    @Test
    void parsesSubtractive() {
        assertEquals(1994, RomanNumerals.fromRoman("MCMXCIV"));
        assertEquals(49, RomanNumerals.fromRoman("XLIX"));
    }

    @Test
    void rejectsOutOfRange() {
        assertThrows(IllegalArgumentException.class, () -> RomanNumerals.toRoman(0));
        assertThrows(IllegalArgumentException.class, () -> RomanNumerals.toRoman(4000));
    }

    @Test
    void rejectsUnknownSymbols() {
        assertThrows(IllegalArgumentException.class, () -> RomanNumerals.fromRoman("XIZ"));
    }
}
