module github.com/acme/urlpath

go 1.19
