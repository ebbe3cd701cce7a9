module github.com/acme/bytesize

go 1.19
