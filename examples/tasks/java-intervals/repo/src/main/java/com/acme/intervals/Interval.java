package com.acme.intervals;

/** A closed interval [start, end] of integers. */
public record Interval(int start, int end) {
    public Interval {
        if (start > end) {
            throw new IllegalArgumentException("start " + start + " > end " + end);
        }
    }

    public int length() {
        return end - start;
    }

    public boolean overlaps(Interval other) {
        return start <= other.end && other.start <= end;
    }

    @Override
    public String toString() {
        return "[" + start + ", " + end + "]";
    }
}
