// A throwaway self-signed certificate for a fake hub over https, made with
// node:crypto alone: a P-256 key and a minimal X.509 v3 certificate
// (CN=localhost, valid from a day ago to a day ahead, for 127.0.0.1 and
// localhost) in hand-written DER. A client trusts it only when told to: its
// users run the client in a child process started with NODE_EXTRA_CA_CERTS
// naming the certificate's file, so certificates stay checked.

import { generateKeyPairSync, sign } from 'node:crypto';

/**
 * A DER element: tag, length, contents.
 * @param {number} tag
 * @param {Buffer[]} parts
 */
function der(tag, ...parts) {
  const body = Buffer.concat(parts);
  const n = body.length;
  let len;
  if (n < 0x80) len = Buffer.from([n]);
  else if (n < 0x100) len = Buffer.from([0x81, n]);
  else len = Buffer.from([0x82, n >> 8, n & 0xff]);
  return Buffer.concat([Buffer.from([tag]), len, body]);
}

const seq = (/** @type {Buffer[]} */ ...p) => der(0x30, ...p);
const ecdsaWithSHA256 = seq(der(0x06, Buffer.from([0x2a, 0x86, 0x48, 0xce, 0x3d, 0x04, 0x03, 0x02])));
const commonName = Buffer.from([0x55, 0x04, 0x03]);
const subjectAltName = Buffer.from([0x55, 0x1d, 0x11]);
const basicConstraints = Buffer.from([0x55, 0x1d, 0x13]);

/** @param {Date} d as UTCTime (YYMMDDHHMMSSZ) */
function utcTime(d) {
  const s = d.toISOString(); // 2026-12-02T01:02:03.456Z
  return der(0x17, Buffer.from(s.slice(2, 4) + s.slice(5, 7) + s.slice(8, 10) + s.slice(11, 13) + s.slice(14, 16) + s.slice(17, 19) + 'Z'));
}

/**
 * A key and a self-signed certificate, both PEM.
 * @returns {{key: string, cert: string}}
 */
export function selfSigned() {
  const { privateKey, publicKey } = generateKeyPairSync('ec', { namedCurve: 'P-256' });
  const name = seq(der(0x31, seq(der(0x06, commonName), der(0x0c, Buffer.from('localhost')))));
  const day = 24 * 3600 * 1000;
  const extensions = der(0xa3, seq(
    // subjectAltName: IP 127.0.0.1 and DNS localhost, which hostname checks read
    seq(der(0x06, subjectAltName), der(0x04, seq(der(0x87, Buffer.from([127, 0, 0, 1])), der(0x82, Buffer.from('localhost'))))),
    // basicConstraints: CA, so that it may anchor its own chain
    seq(der(0x06, basicConstraints), der(0x04, seq(der(0x01, Buffer.from([0xff]))))),
  ));
  const tbs = seq(
    der(0xa0, der(0x02, Buffer.from([0x02]))), // version: v3
    der(0x02, Buffer.from([0x01])), // serial
    ecdsaWithSHA256,
    name, // issuer
    seq(utcTime(new Date(Date.now() - day)), utcTime(new Date(Date.now() + day))),
    name, // subject
    publicKey.export({ type: 'spki', format: 'der' }),
    extensions,
  );
  const cert = seq(tbs, ecdsaWithSHA256, der(0x03, Buffer.from([0]), sign('sha256', tbs, privateKey)));
  const pem = cert.toString('base64').replace(/.{1,64}/g, '$&\n');
  return {
    key: /** @type {string} */ (privateKey.export({ type: 'pkcs8', format: 'pem' })),
    cert: `-----BEGIN CERTIFICATE-----\n${pem}-----END CERTIFICATE-----\n`,
  };
}
