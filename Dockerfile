# Multi-stage build of the hub: a static binary on a distroless base.
FROM golang:1.26 AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
RUN CGO_ENABLED=0 go build -trimpath -ldflags="-s -w" -o /out/marconi ./cmd/marconi

FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /out/marconi /marconi
EXPOSE 8080
ENTRYPOINT ["/marconi"]
CMD ["serve"]
