package com.acme.http;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.util.List;
import java.util.Map;
import org.junit.jupiter.api.Test;

class QueryStringTest {
    @Test
    void parsesPairs() {
        Map<String, List<String>> q = QueryString.parse("page=2&sort=name");
        assertEquals("2", QueryString.first(q, "page"));
        assertEquals("name", QueryString.first(q, "sort"));
    }

    @Test
    void collectsRepeatedKeys() {
        assertEquals(List.of("a", "b"), QueryString.parse("tag=a&tag=b").get("tag"));
    }

    @Test
    void decodesPercentAndPlus() {
        assertEquals("two words", QueryString.first(QueryString.parse("q=two+words"), "q"));
        assertEquals("a&b", QueryString.first(QueryString.parse("q=a%26b"), "q"));
    }

    @Test
    void keepsEqualsInValue() {
        assertEquals("abc==", QueryString.first(QueryString.parse("token=abc=="), "token"));
    }

    @Test
    void emptyQuery() {
        assertTrue(QueryString.parse("").isEmpty());
        assertNull(QueryString.first(QueryString.parse(null), "x"));
    }

    @Test
    void buildRoundTrips() {
        String query = "q=two+words&tag=a&tag=b";
        assertEquals(query, QueryBuilder.build(QueryString.parse(query)));
    }
}
