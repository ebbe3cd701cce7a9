package com.acme.intervals;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.util.List;
import org.junit.jupiter.api.Test;

class IntervalMergerTest {
    @Test
    void mergesOverlapping() {
        assertEquals(List.of(new Interval(1, 6), new Interval(8, 10)),
                IntervalMerger.merge(List.of(new Interval(8, 10), new Interval(1, 3), new Interval(2, 6))));
    }

    @Test
    void mergesTouchingIntervals() {
        assertEquals(List.of(new Interval(1, 5)),
                IntervalMerger.merge(List.of(new Interval(1, 3), new Interval(3, 5))));
    }

    @Test
    void emptyInput() {
        assertTrue(IntervalMerger.merge(List.of()).isEmpty());
    }

    @Test
    void rejectsReversedInterval() {
        assertThrows(IllegalArgumentException.class, () -> new Interval(5, 1));
    }
}
